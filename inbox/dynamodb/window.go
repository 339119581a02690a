package dynamodb

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Defaults and limits of [WindowConfig].
const (
	// KeySizeDefault is the stored key size: 16 base64url characters of
	// SHA-256, 96 bits.
	KeySizeDefault = 16
	// KeySizeMin (60 bits) and KeySizeMax (all 43 characters of an
	// unpadded base64url SHA-256) bound KeySize.
	KeySizeMin = 10
	KeySizeMax = 43
	// KeysAttributeDefault names the list of keys on the item.
	KeysAttributeDefault = "idempotency_keys"
	// WindowMaxAttemptsDefault bounds the rounds of one Apply.
	WindowMaxAttemptsDefault = 5
	// MaxWindow bounds WindowConfig.Size (a window of 10-byte keys in an
	// empty item holds at most about 37,000).
	MaxWindow = 50000
)

// reservedPrefix starts the expression names and values the Window uses.
const reservedPrefix = "inbox_"

// ErrConditionFailed is returned (wrapped) by [Window.Apply] when the
// update's own Condition was false: nothing was written. The key was not
// used, so the caller may try again with the same key.
var ErrConditionFailed = errors.New("inbox/dynamodb: the update's condition is false")

// WindowConfig configures a [Window]. Zero fields take their defaults.
type WindowConfig struct {
	// Table is the table name. Required.
	Table string
	// Size is N, the number of recent keys each item keeps. Required; size
	// it with [Capacity.Plan] (its Window). Items whose window has another
	// length (after a change of Size) are resized on their next update:
	// grown with placeholders at the old end, or shrunk by dropping the
	// oldest keys.
	Size int
	// KeySize is the stored size of a key in bytes; default
	// [KeySizeDefault], between [KeySizeMin] and [KeySizeMax].
	KeySize int
	// KeysAttribute names the list attribute holding the keys; default
	// [KeysAttributeDefault].
	KeysAttribute string
	// MaxAttempts bounds the requests of one Apply that must create or
	// initialise the item or settle a race; default
	// [WindowMaxAttemptsDefault].
	MaxAttempts int
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c WindowConfig) WithDefaults() WindowConfig {
	c.KeySize = cmp.Or(c.KeySize, KeySizeDefault)
	c.KeysAttribute = cmp.Or(c.KeysAttribute, KeysAttributeDefault)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, WindowMaxAttemptsDefault)
	return c
}

func (c WindowConfig) validate() error {
	switch {
	case c.Table == "":
		return errors.New("inbox/dynamodb: WindowConfig.Table is empty: set the table name")
	case c.KeySize < KeySizeMin || c.KeySize > KeySizeMax:
		return fmt.Errorf("inbox/dynamodb: WindowConfig.KeySize must be between %d and %d bytes, got %d", KeySizeMin, KeySizeMax, c.KeySize)
	case c.Size < 1 || c.Size > MaxWindow:
		return fmt.Errorf("inbox/dynamodb: WindowConfig.Size must be between 1 and %d keys (size it with Capacity.Plan), got %d", MaxWindow, c.Size)
	case c.MaxAttempts < 1 || c.MaxAttempts > 100:
		return fmt.Errorf("inbox/dynamodb: WindowConfig.MaxAttempts must be between 1 and 100, got %d", c.MaxAttempts)
	}
	if bytes := listOverhead + len(c.KeysAttribute) + c.Size*(c.KeySize+elementOverhead); bytes > MaxItemBytes {
		return fmt.Errorf("inbox/dynamodb: WindowConfig.Size %d × (KeySize %d + 1) bytes makes a %d-byte list, over DynamoDB's %d-byte item limit: lower Size or KeySize (see Capacity.Plan)",
			c.Size, c.KeySize, bytes, MaxItemBytes)
	}
	return nil
}

// Window applies updates to items idempotently: each item keeps its last
// Size idempotency keys, and an update whose key is among them is refused
// atomically, in the same conditional UpdateItem that applies it. A key is
// remembered until Size later updates of the same item have pushed it out;
// [Capacity] relates that to time. It is safe for concurrent use.
type Window struct {
	client      API
	cfg         WindowConfig
	placeholder string
}

// NewWindow returns a Window for cfg.Table.
func NewWindow(client API, cfg WindowConfig) (*Window, error) {
	if client == nil {
		return nil, errors.New("inbox/dynamodb: NewWindow needs a non-nil client")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// '.' is not a base64url character, so a placeholder never equals a key.
	return &Window{client: client, cfg: cfg, placeholder: strings.Repeat(".", cfg.KeySize)}, nil
}

// HashKey returns the stored form of an idempotency key: the first KeySize
// characters of the unpadded base64url SHA-256 of key.
func (w *Window) HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return base64.RawURLEncoding.EncodeToString(sum[:])[:w.cfg.KeySize]
}

// Update is an update to apply with [Window.Apply], in DynamoDB's update
// expression syntax without the clause keywords: each element of Set is one
// SET action ("#balance = #balance + :amount"), and so on. The window's own
// SET and REMOVE actions are added to them.
type Update struct {
	Set, Remove, Add, Delete []string
	// Condition, if not empty, must also hold for the update to apply (for
	// example "#balance >= :amount"). When false, Apply returns
	// ErrConditionFailed.
	Condition string
	// Names and Values are the expression attribute names and values of
	// the actions and the condition. Names and values starting with
	// "#inbox_" and ":inbox_" are reserved.
	Names  map[string]string
	Values Item
	// Initial holds the attributes an item is created with when it does not
	// exist yet, besides its key and the window (for example a zero
	// balance); the update then applies to it.
	Initial Item
	// ReturnValues asks for the item's attributes after (ALL_NEW,
	// UPDATED_NEW) or before the update; default none.
	ReturnValues types.ReturnValue
}

func (u *Update) validate() error {
	if len(u.Set)+len(u.Remove)+len(u.Add)+len(u.Delete) == 0 {
		return errors.New("inbox/dynamodb: Update has no action: set at least one of Set, Remove, Add, Delete")
	}
	for n := range u.Names {
		if strings.HasPrefix(n, "#"+reservedPrefix) {
			return fmt.Errorf("inbox/dynamodb: Update.Names: %q uses the reserved prefix #%s", n, reservedPrefix)
		}
	}
	for v := range u.Values {
		if strings.HasPrefix(v, ":"+reservedPrefix) {
			return fmt.Errorf("inbox/dynamodb: Update.Values: %q uses the reserved prefix :%s", v, reservedPrefix)
		}
	}
	return nil
}

// Result is the outcome of [Window.Apply].
type Result struct {
	// Applied is true when the update was applied, false for a duplicate
	// key (nothing written).
	Applied bool
	// Attributes are those asked for by Update.ReturnValues when applied;
	// for a duplicate, the item's key and window as found, if known.
	Attributes Item
}

// Apply applies u to the item with key, at most once per idempotencyKey
// among the item's last Size keys. It returns Applied true when it applied
// the update (and recorded the key, dropping the oldest), false with a nil
// error for a duplicate.
//
// One UpdateItem in the common case. When the item does not exist, Apply
// creates it with Size placeholder keys and u.Initial (PutItem with
// attribute_not_exists) and applies the update to it; an item without the
// window gets one. A failed condition is told apart from a duplicate by the
// old item DynamoDB returns with the failure
// (ReturnValuesOnConditionCheckFailure ALL_OLD) or, where that is not
// supported (dynalite), a strongly consistent re-read: a missing item is
// never mistaken for a duplicate, so no update is lost. Apply gives up after
// MaxAttempts rounds of racing writers. Errors other than a failed condition
// are returned at once; Apply does not retry them.
func (w *Window) Apply(ctx context.Context, key Item, idempotencyKey string, u Update) (Result, error) {
	if len(key) == 0 {
		return Result{}, errors.New("inbox/dynamodb: Apply: the item key is empty")
	}
	if idempotencyKey == "" {
		return Result{}, errors.New("inbox/dynamodb: Apply: the idempotency key is empty")
	}
	if err := u.validate(); err != nil {
		return Result{}, err
	}
	hashed := w.HashKey(idempotencyKey)
	in := w.updateInput(key, hashed, &u)
	pkName := slices.Sorted(maps.Keys(key))[0]
	attempts := w.cfg.MaxAttempts

	conditionFalse := 0 // rounds whose re-read suggests u.Condition was false
	for i := 0; i < attempts; i++ {
		out, err := w.client.UpdateItem(ctx, in)
		if err == nil {
			return Result{Applied: true, Attributes: out.Attributes}, nil
		}
		var ccf *types.ConditionalCheckFailedException
		if !errors.As(err, &ccf) {
			return Result{}, fmt.Errorf("inbox/dynamodb: update %s: %w", w.cfg.Table, err)
		}
		old, atomic := ccf.Item, ccf.Item != nil
		if !atomic {
			if old, err = w.read(ctx, key, pkName); err != nil {
				return Result{}, err
			}
		}
		switch keys, hasKeys := old[w.cfg.KeysAttribute].(*types.AttributeValueMemberL); {
		case len(old) == 0:
			if err := w.create(ctx, key, pkName, u.Initial); err != nil {
				return Result{}, err
			}
		case !hasKeys && old[w.cfg.KeysAttribute] != nil:
			return Result{}, fmt.Errorf("inbox/dynamodb: attribute %q of the item holds a %T, not the list of keys: set WindowConfig.KeysAttribute to an unused name", w.cfg.KeysAttribute, old[w.cfg.KeysAttribute])
		case !hasKeys:
			if err := w.initWindow(ctx, key, pkName); err != nil {
				return Result{}, err
			}
		case containsKey(keys.Value, hashed):
			return Result{Applied: false, Attributes: old}, nil
		case len(keys.Value) != w.cfg.Size:
			if err := w.resize(ctx, key, len(keys.Value)); err != nil {
				return Result{}, err
			}
			if i == 0 {
				attempts++ // resizing is not a race
			}
		case u.Condition != "":
			// With the atomic old item this is certain; after a re-read,
			// believe it when it is seen twice.
			conditionFalse++
			if atomic || conditionFalse >= 2 {
				return Result{}, fmt.Errorf("%w: %s", ErrConditionFailed, u.Condition)
			}
		}
		// Otherwise a concurrent writer changed the item between the
		// update and the re-read: try again.
	}
	return Result{}, fmt.Errorf("inbox/dynamodb: apply to %s: gave up after %d attempts racing other writers (WindowConfig.MaxAttempts)", w.cfg.Table, w.cfg.MaxAttempts)
}

func (w *Window) updateInput(key Item, hashed string, u *Update) *dynamodb.UpdateItemInput {
	names := map[string]string{"#inbox_keys": w.cfg.KeysAttribute}
	maps.Copy(names, u.Names)
	values := Item{":inbox_key": &types.AttributeValueMemberS{Value: hashed}}
	maps.Copy(values, u.Values)

	var expr strings.Builder
	clause := func(keyword string, own string, actions []string) {
		all := actions
		if own != "" {
			all = append([]string{own}, actions...)
		}
		if len(all) == 0 {
			return
		}
		if expr.Len() > 0 {
			expr.WriteByte(' ')
		}
		expr.WriteString(keyword + " " + strings.Join(all, ", "))
	}
	// The list holds Size keys (the condition checks it): setting index
	// Size appends, removing index 0 drops the oldest.
	clause("SET", "#inbox_keys["+strconv.Itoa(w.cfg.Size)+"] = :inbox_key", u.Set)
	clause("REMOVE", "#inbox_keys[0]", u.Remove)
	clause("ADD", "", u.Add)
	clause("DELETE", "", u.Delete)
	values[":inbox_size"] = &types.AttributeValueMemberN{Value: strconv.Itoa(w.cfg.Size)}

	cond := "size(#inbox_keys) = :inbox_size AND NOT contains(#inbox_keys, :inbox_key)"
	if u.Condition != "" {
		cond += " AND (" + u.Condition + ")"
	}
	in := &dynamodb.UpdateItemInput{
		TableName:                           aws.String(w.cfg.Table),
		Key:                                 key,
		UpdateExpression:                    aws.String(expr.String()),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	if u.ReturnValues != "" {
		in.ReturnValues = u.ReturnValues
	}
	return in
}

// read returns the item's key attribute and window, strongly consistently;
// nil when the item does not exist.
func (w *Window) read(ctx context.Context, key Item, pkName string) (Item, error) {
	out, err := w.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:                aws.String(w.cfg.Table),
		Key:                      key,
		ConsistentRead:           aws.Bool(true),
		ProjectionExpression:     aws.String("#inbox_pk, #inbox_keys"),
		ExpressionAttributeNames: map[string]string{"#inbox_pk": pkName, "#inbox_keys": w.cfg.KeysAttribute},
	})
	if err != nil {
		return nil, fmt.Errorf("inbox/dynamodb: re-read from %s: %w", w.cfg.Table, err)
	}
	return out.Item, nil
}

func (w *Window) placeholders() *types.AttributeValueMemberL {
	l := make([]types.AttributeValue, w.cfg.Size)
	for i := range l {
		l[i] = &types.AttributeValueMemberS{Value: w.placeholder}
	}
	return &types.AttributeValueMemberL{Value: l}
}

// create puts the item with Size placeholder keys if it does not exist.
// Losing the race to another creator is fine.
func (w *Window) create(ctx context.Context, key Item, pkName string, initial Item) error {
	it := copyItem(initial)
	maps.Copy(it, key)
	it[w.cfg.KeysAttribute] = w.placeholders()
	_, err := w.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                aws.String(w.cfg.Table),
		Item:                     it,
		ConditionExpression:      aws.String("attribute_not_exists(#inbox_pk)"),
		ExpressionAttributeNames: map[string]string{"#inbox_pk": pkName},
	})
	var ccf *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &ccf) {
		return fmt.Errorf("inbox/dynamodb: create item in %s: %w", w.cfg.Table, err)
	}
	return nil
}

// initWindow gives an existing item without a window its placeholder keys.
func (w *Window) initWindow(ctx context.Context, key Item, pkName string) error {
	_, err := w.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(w.cfg.Table),
		Key:                       key,
		UpdateExpression:          aws.String("SET #inbox_keys = :inbox_placeholders"),
		ConditionExpression:       aws.String("attribute_exists(#inbox_pk) AND attribute_not_exists(#inbox_keys)"),
		ExpressionAttributeNames:  map[string]string{"#inbox_pk": pkName, "#inbox_keys": w.cfg.KeysAttribute},
		ExpressionAttributeValues: Item{":inbox_placeholders": w.placeholders()},
	})
	var ccf *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &ccf) {
		return fmt.Errorf("inbox/dynamodb: add the window to an item in %s: %w", w.cfg.Table, err)
	}
	return nil
}

// resize brings a window of length n to Size: placeholders are added at the
// old end, or the oldest keys dropped. Conditional on the length, so that a
// concurrent resize or update makes it a no-op.
func (w *Window) resize(ctx context.Context, key Item, n int) error {
	in := &dynamodb.UpdateItemInput{
		TableName:                aws.String(w.cfg.Table),
		Key:                      key,
		ConditionExpression:      aws.String("size(#inbox_keys) = :inbox_n"),
		ExpressionAttributeNames: map[string]string{"#inbox_keys": w.cfg.KeysAttribute},
		ExpressionAttributeValues: Item{
			":inbox_n": &types.AttributeValueMemberN{Value: strconv.Itoa(n)},
		},
	}
	if n < w.cfg.Size {
		pads := make([]types.AttributeValue, w.cfg.Size-n)
		for i := range pads {
			pads[i] = &types.AttributeValueMemberS{Value: w.placeholder}
		}
		in.UpdateExpression = aws.String("SET #inbox_keys = list_append(:inbox_pads, #inbox_keys)")
		in.ExpressionAttributeValues[":inbox_pads"] = &types.AttributeValueMemberL{Value: pads}
	} else {
		drop := make([]string, n-w.cfg.Size)
		for i := range drop {
			drop[i] = "#inbox_keys[" + strconv.Itoa(i) + "]"
		}
		in.UpdateExpression = aws.String("REMOVE " + strings.Join(drop, ", "))
	}
	_, err := w.client.UpdateItem(ctx, in)
	var ccf *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &ccf) {
		return fmt.Errorf("inbox/dynamodb: resize the window of an item in %s from %d to %d keys: %w", w.cfg.Table, n, w.cfg.Size, err)
	}
	return nil
}

func containsKey(l []types.AttributeValue, hashed string) bool {
	for _, v := range l {
		if s, ok := v.(*types.AttributeValueMemberS); ok && s.Value == hashed {
			return true
		}
	}
	return false
}

// Keys returns the stored keys of the item's window, oldest first,
// placeholders included (strongly consistent read); nil if the item does not
// exist.
func (w *Window) Keys(ctx context.Context, key Item) ([]string, error) {
	pkName := slices.Sorted(maps.Keys(key))[0]
	it, err := w.read(ctx, key, pkName)
	if err != nil || it == nil {
		return nil, err
	}
	l, _ := it[w.cfg.KeysAttribute].(*types.AttributeValueMemberL)
	if l == nil {
		return nil, nil
	}
	keys := make([]string, 0, len(l.Value))
	for _, v := range l.Value {
		if s, ok := v.(*types.AttributeValueMemberS); ok {
			keys = append(keys, s.Value)
		}
	}
	return keys, nil
}

// Placeholder returns the value that fills the unused slots of a window.
func (w *Window) Placeholder() string { return w.placeholder }
