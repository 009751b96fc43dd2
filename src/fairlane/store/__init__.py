"""Floor 2: the Redis store, the only place that knows keys and scripts."""
