package postgres

// CleanupSQL exposes the cleanup statement to the plan test.
func CleanupSQL(in *Inbox) string { return in.q.cleanup }
