package natsjs

// TokensHeld is how many of p's MaxInFlight tokens are taken: none once
// every call has returned.
func TokensHeld(p *Publisher) int { return len(p.sem) }
