from headwise.cli import entry

entry()
