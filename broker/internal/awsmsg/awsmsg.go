// Package awsmsg is what the SQS and SNS publishers share: how an outbox
// message becomes an AWS message (a text body and String message
// attributes, at most 10), the FIFO group of a key, and what an AWS error
// code says about the destination.
package awsmsg

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outboxrelay/outbox"
)

// MaxAttributes is the most message attributes SQS and SNS take per
// message.
const MaxAttributes = 10

// Attribute names the publishers set (String attributes).
const (
	AttrID        = "Outbox-Id"
	AttrKey       = "Outbox-Key"
	AttrCreatedAt = "Outbox-Created-At"
	AttrEncoding  = "Outbox-Encoding"
	AttrHeaders   = "Outbox-Headers"
)

// Message is an outbox message as SQS or SNS carries it.
type Message struct {
	Body  string
	Attrs map[string]string // String attributes, by name
	// Size is what SQS and SNS count against their limit: the body and
	// each attribute's name, type ("String") and value.
	Size int
}

// Encode turns m into a Message: the payload as the body when it is text
// SQS and SNS accept, else base64 (AttrEncoding "base64"); an empty
// payload as "-" (AttrEncoding "empty"); the ID, key and creation time as
// attributes; the headers as attributes of their own when they fit (at
// most MaxAttributes in all, names SQS accepts, non-empty values), else
// all of them as one JSON object in AttrHeaders. It fails for a key or
// header the services cannot carry.
func Encode(m *outbox.Message) (Message, error) {
	e := Message{Attrs: map[string]string{}}
	put := func(name, value string) {
		e.Attrs[name] = value
		e.Size += len(name) + len("String") + len(value)
	}
	put(AttrID, m.ID)
	if m.Key != "" {
		if !ValidText(m.Key) {
			return e, fmt.Errorf("message %s: the key holds characters SQS and SNS refuse in an attribute (invalid UTF-8 or control characters other than tab, CR and LF)", m.ID)
		}
		put(AttrKey, m.Key)
	}
	if !m.CreatedAt.IsZero() {
		put(AttrCreatedAt, m.CreatedAt.UTC().Format(time.RFC3339Nano))
	}
	e.Body = string(m.Payload)
	switch {
	case len(m.Payload) == 0:
		e.Body = "-"
		put(AttrEncoding, "empty")
	case !ValidText(e.Body):
		e.Body = base64.StdEncoding.EncodeToString(m.Payload)
		put(AttrEncoding, "base64")
	}
	e.Size += len(e.Body)
	if len(m.Headers) == 0 {
		return e, nil
	}
	if headersFit(m.Headers, MaxAttributes-len(e.Attrs)) {
		for k, v := range m.Headers {
			put(k, v)
		}
		return e, nil
	}
	for k, v := range m.Headers {
		if !utf8.ValidString(v) || !utf8.ValidString(k) {
			return e, fmt.Errorf("message %s: header %q is not valid UTF-8, which JSON cannot carry", m.ID, k)
		}
	}
	b, err := json.Marshal(m.Headers)
	if err != nil {
		return e, fmt.Errorf("message %s: headers: %w", m.ID, err)
	}
	put(AttrHeaders, string(b))
	return e, nil
}

// GroupID is the MessageGroupId of a message with key and id on a FIFO
// queue or topic: the key itself when the services accept it (1 to 128
// printable ASCII characters without space), else "outbox-sha256-" and
// the hex SHA-256 of the key (one key is always one group); a message
// without key gets its own group (its ID): no order, as the outbox
// promises none for it.
func GroupID(key, id string) string {
	if key == "" {
		return id
	}
	if len(key) <= 128 {
		ok := true
		for i := 0; i < len(key) && ok; i++ {
			ok = key[i] > ' ' && key[i] < 0x7f
		}
		if ok {
			return key
		}
	}
	sum := sha256.Sum256([]byte(key))
	return "outbox-sha256-" + hex.EncodeToString(sum[:])
}

// ValidText reports whether s is text SQS and SNS accept in a body or
// attribute: UTF-8 of #x9, #xA, #xD, #x20 to #xD7FF, #xE000 to #xFFFD and
// #x10000 to #x10FFFF.
func ValidText(s string) bool {
	for _, r := range s {
		switch {
		case r == utf8.RuneError:
			return false // invalid UTF-8 (a real U+FFFD is refused too: rare, and safe)
		case r == 0x9, r == 0xA, r == 0xD:
		case r >= 0x20 && r <= 0xD7FF, r >= 0xE000 && r <= 0xFFFD, r >= 0x10000 && r <= 0x10FFFF:
		default:
			return false
		}
	}
	return true
}

// headersFit reports whether headers can travel as attributes of their
// own, in at most room attributes.
func headersFit(headers map[string]string, room int) bool {
	if len(headers) > room {
		return false
	}
	for k, v := range headers {
		if v == "" || !ValidText(v) || !validAttrName(k) {
			return false
		}
	}
	return true
}

// validAttrName reports whether SQS and SNS accept name as a message
// attribute name and it is not one of the publishers'.
func validAttrName(name string) bool {
	lower := strings.ToLower(name)
	if name == "" || len(name) > 256 || strings.HasPrefix(lower, "aws.") || strings.HasPrefix(lower, "amazon.") ||
		strings.HasPrefix(lower, "outbox-") || name[0] == '.' || name[len(name)-1] == '.' || strings.Contains(name, "..") {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// Missing is what BlockedKind says of a missing queue or topic; a caller
// drops its cached URL or ARN on it.
const Missing = "it does not exist: create it"

// BlockedKind says why an SQS or SNS error code blocks the destination,
// or "" when it does not.
func BlockedKind(code string) string {
	switch code {
	case "QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue", "NotFound", "NotFoundException",
		"AWS.SimpleNotificationService.NonExistentTopic":
		return Missing
	case "AuthorizationError", "KmsAccessDenied", "KmsDisabled", "KmsNotFound", "KmsInvalidState", "KmsInvalidKeyUsage",
		"KmsOptInRequired", "KMSAccessDenied", "KMSDisabled", "KMSNotFound", "KMSInvalidState", "KMSOptInRequired":
		return "access denied: grant the relay's role sqs:SendMessage or sns:Publish on it (and kms:GenerateDataKey and kms:Decrypt on its key, if encrypted)"
	case "InvalidClientTokenId", "SignatureDoesNotMatch", "UnrecognizedClientException", "ExpiredToken",
		"MissingAuthenticationToken", "InvalidSecurity", "IncompleteSignature":
		return "AWS refuses the credentials"
	case "RequestThrottled", "ThrottlingException", "Throttling", "Throttled", "OverLimit", "KmsThrottled", "KMSThrottling",
		"KMS.ThrottlingException":
		return "throttled"
	case "ServiceUnavailable", "AWS.SimpleQueueService.QueueDeletedRecently", "QueueDeletedRecently":
		return "the service is unavailable"
	}
	if strings.HasPrefix(code, "AccessDenied") || strings.HasPrefix(code, "KMS.") {
		return "access denied: grant the relay's role sqs:SendMessage or sns:Publish on it (and the KMS key's permissions, if encrypted)"
	}
	return ""
}

// InvalidCodes are request error codes meaning the request's messages are
// invalid.
var InvalidCodes = map[string]bool{
	"InvalidMessageContents": true, "MessageTooLong": true, "InvalidParameterValue": true, "InvalidAttributeName": true,
	"InvalidAttributeValue": true, "BatchRequestTooLong": true, "InvalidBatchEntryId": true, "MissingParameter": true,
	"AWS.SimpleQueueService.InvalidBatchEntryId": true, "AWS.SimpleQueueService.BatchRequestTooLong": true,
	"InvalidParameter": true, "ParameterValueInvalid": true, "BatchRequestTooLongException": true, "InvalidBatchEntryIdException": true,
}
