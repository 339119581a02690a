package kafka

// BufferedRecords is how many records p's client holds, produced and not
// yet acknowledged or failed.
func BufferedRecords(p *Publisher) int64 { return p.client.BufferedProduceRecords() }
