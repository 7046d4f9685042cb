"""ASGI plumbing shared by the HTTP layer and the relay: message helpers, body reading, disconnect watching."""
