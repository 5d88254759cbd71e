"""The wire format: how messages and packets become bytes and back."""
