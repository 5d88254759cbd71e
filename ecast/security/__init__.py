"""Credentials, the development secret, and what the runtime proves with them."""
