"""The bounded HTTP front: connections, TLS, admission, login, web config (docs/security.md)."""
