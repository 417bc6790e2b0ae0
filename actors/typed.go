package actors

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/asynkron/protoactor-go/actor"
)

// Typed returns the props of a handler actor that decodes each event's data
// (JSON) into a T and calls fn with it, as a group's Handler, as [Func] and
// [BatchFunc] do:
//
//	actors.GroupOptions{..., Handler: actors.Typed(handle)}
//
// An event whose data does not decode into a T is dead-lettered at once
// with a [*DecodeError] as the reason (wrapped in a [*PermanentError]): no
// retry would decode it. fn answers as a [HandlerFunc] does.
func Typed[T any](fn func(ctx context.Context, d *Delivery, v T) error) *actor.Props {
	if fn == nil {
		panic("kumi: actors.Typed: nil function")
	}
	return Func(TypedFunc(fn))
}

// TypedFunc is [Typed] as a [HandlerFunc], to compose with other functions
// (a Router's [On] is built on it).
func TypedFunc[T any](fn func(ctx context.Context, d *Delivery, v T) error) HandlerFunc {
	if fn == nil {
		panic("kumi: actors.TypedFunc: nil function")
	}
	return func(ctx context.Context, d *Delivery) error {
		var v T
		if err := json.Unmarshal(d.Event.Data, &v); err != nil {
			return Permanent(&DecodeError{EventType: d.Event.Type, Into: reflect.TypeFor[T]().String(), Err: err})
		}
		return fn(ctx, d, v)
	}
}

// DecodeError says that an event's data did not decode into the type its
// handler expects.
type DecodeError struct {
	// EventType is the event's type; Into the Go type it was decoded into.
	EventType, Into string
	// Err is encoding/json's error.
	Err error
}

// Error names the event type, the Go type and what did not decode.
func (e *DecodeError) Error() string {
	return fmt.Sprintf("kumi: decode %s event into %s: %v", e.EventType, e.Into, e.Err)
}

// Unwrap returns encoding/json's error.
func (e *DecodeError) Unwrap() error { return e.Err }

// Router dispatches deliveries by event type to a function per type:
// register them with [On] (decoding each type's data into its own Go type)
// or [Router.HandleFunc], then give [Router.Props] as a group's Handler. An
// event of a type with no function is acked, and so skipped, unless
// [Router.Otherwise] says what to do with it. The zero Router is ready to
// use. Register every function before the group starts: a Router is not
// safe for registration while it handles deliveries.
type Router struct {
	byType    map[string]HandlerFunc
	otherwise HandlerFunc
}

// On registers fn for events of type eventType, their data decoded into a
// T as by [TypedFunc]. It panics if eventType is empty or already registered,
// as registering twice is a programming error.
func On[T any](r *Router, eventType string, fn func(ctx context.Context, d *Delivery, v T) error) {
	r.HandleFunc(eventType, TypedFunc(fn))
}

// HandleFunc registers fn for events of type eventType. It panics if
// eventType is empty or already registered, or fn is nil.
func (r *Router) HandleFunc(eventType string, fn HandlerFunc) {
	switch {
	case eventType == "":
		panic("kumi: Router: empty event type")
	case fn == nil:
		panic(fmt.Sprintf("kumi: Router: nil function for event type %q", eventType))
	}
	if _, dup := r.byType[eventType]; dup {
		panic(fmt.Sprintf("kumi: Router: event type %q registered twice", eventType))
	}
	if r.byType == nil {
		r.byType = map[string]HandlerFunc{}
	}
	r.byType[eventType] = fn
}

// Otherwise sets the function for events of types with none registered;
// by default they are acked.
func (r *Router) Otherwise(fn HandlerFunc) { r.otherwise = fn }

// Handle is the Router as a [HandlerFunc]: it calls the function registered
// for d's event type.
func (r *Router) Handle(ctx context.Context, d *Delivery) error {
	if fn, ok := r.byType[d.Event.Type]; ok {
		return fn(ctx, d)
	}
	if r.otherwise != nil {
		return r.otherwise(ctx, d)
	}
	return nil
}

// Props returns the props of a handler actor that dispatches through r:
// [Func](r.Handle).
func (r *Router) Props() *actor.Props { return Func(r.Handle) }
