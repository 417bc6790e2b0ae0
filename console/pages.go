package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/redact"
)

// pages are the HTML templates, one per page, each with the layout.
type pages map[string]*template.Template

var pageNames = []string{"overview", "subscription", "letters", "letter", "error"}

func parsePages() (pages, error) {
	funcs := template.FuncMap{
		"seg":  url.PathEscape,
		"time": func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	}
	out := pages{}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "assets/templates/layout.html",
			"assets/templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// page is what every template receives.
type page struct {
	Name    string // the template, also the body's data-page
	Title   string
	Root    string // relative path to the console's root
	CSRF    string // "" when actions are disabled
	Actions actionsView
	Sub     string // the subscription, "" on the overview
	Data    any
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, p page) {
	p.Root = root(r)
	p.Actions = actionsView{Enabled: c.opts.AllowActions, Replay: c.opts.AllowActions && c.opts.Replay != nil}
	if c.opts.AllowActions {
		p.CSRF = c.csrf
	}
	var buf bytes.Buffer
	if err := c.pages[p.Name].Execute(&buf, p); err != nil {
		c.log.Error("console: render", "page", p.Name, "err", redact.URL(err.Error()))
		http.Error(w, "console: internal error rendering the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fail renders the error page; the message is redacted and escaped.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	status, title := statusOf(err), "error"
	if status == http.StatusNotFound {
		title = "not found"
	}
	c.render(w, r, status, page{Name: "error", Title: title, Data: redact.URL(err.Error())})
}

func (c *Console) overviewPage(w http.ResponseWriter, r *http.Request) {
	subs, err := c.summary.get(r.Context(), "")
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, page{Name: "overview", Title: "subscriptions of schema " + c.opts.Store.Schema(),
		Data: subs})
}

func (c *Console) subscriptionPage(w http.ResponseWriter, r *http.Request) {
	sub := r.PathValue("sub")
	if err := c.checkKnown(r.Context(), sub); err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, page{Name: "subscription", Title: sub, Sub: sub,
		Data: c.opts.Categories[sub]})
}

// lettersData is the letters page: a page of letters and the next cursor.
type lettersData struct {
	Letters []eventsource.DeadLetter
	All     bool
	Next    int64 // the cursor of the next page, 0 when none
}

const lettersPerPage = 100

func (c *Console) lettersPage(w http.ResponseWriter, r *http.Request) {
	sub := r.PathValue("sub")
	if err := c.checkKnown(r.Context(), sub); err != nil {
		c.fail(w, r, err)
		return
	}
	q := r.URL.Query()
	after, err := strconv.ParseInt(q.Get("after"), 10, 64)
	if q.Get("after") == "" {
		after, err = 0, nil
	}
	if err != nil || after < 0 {
		c.fail(w, r, fmt.Errorf("%w: after=%q is not a position (an integer >= 0)", errBadRequest, q.Get("after")))
		return
	}
	all := q.Get("all") == "1"
	letters, err := c.opts.Store.DeadLetters(r.Context(), sub, eventsource.DeadLetterFilter{After: after,
		Limit: lettersPerPage, IncludeReplayed: all})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d := lettersData{Letters: letters, All: all}
	if len(letters) == lettersPerPage {
		d.Next = letters[len(letters)-1].Position
	}
	c.render(w, r, http.StatusOK, page{Name: "letters", Title: "dead letters of " + sub, Sub: sub, Data: d})
}

// letterData is one letter and its event (Event nil when not readable).
type letterData struct {
	Letter   eventsource.DeadLetter
	Event    *eventsource.RecordedEvent
	EventErr string
	Data     string // the event's data, indented
	Metadata string
}

func (c *Console) letterPage(w http.ResponseWriter, r *http.Request) {
	sub := r.PathValue("sub")
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		c.fail(w, r, fmt.Errorf("%w: %q is not an event id (a UUID)", errBadRequest, r.PathValue("id")))
		return
	}
	d, err := c.opts.Store.DeadLetter(r.Context(), sub, id)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	ld := letterData{Letter: d}
	if ev, err := eventOf(r.Context(), c.opts.Store, d); err != nil {
		ld.EventErr = redact.URL(err.Error())
	} else {
		ld.Event, ld.Data, ld.Metadata = &ev, indent(ev.Data), indent(ev.Metadata)
	}
	c.render(w, r, http.StatusOK, page{Name: "letter", Title: "dead letter " + id.String(), Sub: sub, Data: ld})
}

// errBadRequest marks a malformed query or path value (HTTP 400).
var errBadRequest = errors.New("bad request")

// eventOf reads a dead letter's event by its position, as `kumi
// dead-letters show` does.
func eventOf(ctx context.Context, store *eventsource.Store, d eventsource.DeadLetter) (eventsource.RecordedEvent, error) {
	evs, err := store.ReadAll(ctx, d.Position-1, 1)
	if err != nil {
		return eventsource.RecordedEvent{}, err
	}
	if len(evs) == 0 || evs[0].ID != d.EventID {
		return eventsource.RecordedEvent{}, fmt.Errorf("no event %s at position %d", d.EventID, d.Position)
	}
	return evs[0], nil
}

func indent(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return string(raw)
	}
	return b.String()
}
