"""Shadow A/B: mirror a sample of requests to a control pool and compare the pair."""
