"""Floor 3: the runtime -- workers, leases, executors and cron."""
