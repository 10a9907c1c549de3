from headwise.cli import main

main()
