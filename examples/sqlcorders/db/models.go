// Written as sqlc v1.31 generates it (see db.go).

package db

type SqlcOrder struct {
	ID       int64
	Customer string
	Status   string
	Total    int64
}
