"""`kvgate plan`: how much RAM the CPU tier should get, from the reuse trace and the server's own cache figures."""
