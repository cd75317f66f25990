"""RL rollouts as a benchmark: ``spec`` (tasks × samples released in batches or waves, weight
updates on a timer; pure), ``des`` (the rollout in DES mode) and ``report`` (its tables)."""
