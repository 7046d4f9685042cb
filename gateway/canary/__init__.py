"""The isolation canary: proof, per pool, that one identity's cached prefix is never served to another."""
