package outbox

// goPool runs functions on goroutines kept between runs. At a steady load
// a relay starts a few short goroutines per producer transaction (a
// publish per worker, a fetch round): each new one grew its stack again
// through pgx or nats.go (copied, 4% of the relay's CPU at 1,000 msgs/s);
// a kept goroutine keeps its stack. A goroutine waits for the next
// function once its own returned, and leaves when the relay is done.
type goPool struct {
	jobs chan func()   // unbuffered: a send succeeds only if one waits
	done chan struct{} // closed when the relay is done
}

func newGoPool() *goPool {
	return &goPool{jobs: make(chan func()), done: make(chan struct{})}
}

// run runs f on a waiting goroutine, or on a new one if none waits (also
// after stop: it then leaves once f returns). A nil pool starts a
// goroutine.
func (g *goPool) run(f func()) {
	if g == nil {
		go f()
		return
	}
	select {
	case g.jobs <- f:
	default:
		go g.loop(f)
	}
}

func (g *goPool) loop(f func()) {
	for {
		f()
		select {
		case f = <-g.jobs:
		case <-g.done:
			return
		}
	}
}

// stop lets the waiting goroutines leave, and the others once their
// function returns.
func (g *goPool) stop() { close(g.done) }
