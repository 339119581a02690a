package bench

import (
	"context"
	"fmt"

	"github.com/outboxrelay/outbox/store/postgres"
)

// Layouts of Options.Layout.
const (
	LayoutPlain = string(postgres.LayoutPlain)
	LayoutRing  = string(postgres.LayoutRing)
)

// applyLayout converts our outbox table to Options.Layout (the ring; plain
// is what NewEnv created). The relay processes find the layout in the
// database and keep the ring with its default rotation.
func (e *Env) applyLayout(ctx context.Context) error {
	if e.opts.Layout != LayoutRing {
		return nil
	}
	st, err := postgres.New(e.Pool, postgres.Options{Schema: e.schema, Layout: postgres.LayoutRing})
	if err != nil {
		return err
	}
	defer st.Close()
	if _, err := st.MigrateWithReport(ctx); err != nil {
		return fmt.Errorf("bench: --layout ring: %w", err)
	}
	return nil
}

// layoutNote names a layout other than plain in a table's heading.
func layoutNote(layout string) string {
	if layout == "" || layout == LayoutPlain {
		return ""
	}
	return ", outbox table layout " + layout
}
