"""headwise — multi-head attention and positional encodings."""
__version__ = "0.1.0"
