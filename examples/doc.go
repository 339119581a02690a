// Package examples shows how postgres.Write joins the transaction of the
// ORMs Go teams write with: GORM (gormorders), ent (entorders), bun
// (bunorders) and sqlc (sqlcorders). Each example's tests run it against a
// real PostgreSQL (internal/testenv). It is a module of its own, so that
// the ORMs' dependencies stay out of the outbox's module.
package examples
