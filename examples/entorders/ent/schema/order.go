// Package schema holds the ent schema of the example; `go generate
// ./entorders/ent` (entgo.io/ent/cmd/ent) generates the client next to it.
package schema

import (
	"entgo.io/ent"
	"entgo.io/ent/dialect/entsql"
	"entgo.io/ent/schema"
	"entgo.io/ent/schema/field"
)

// Order holds the schema definition for the Order entity.
type Order struct {
	ent.Schema
}

// Annotations names the table.
func (Order) Annotations() []schema.Annotation {
	return []schema.Annotation{entsql.Annotation{Table: "ent_orders"}}
}

// Fields of the Order.
func (Order) Fields() []ent.Field {
	return []ent.Field{
		field.String("customer"),
		field.String("status").Default("placed"),
		field.Int64("total"),
	}
}
