package snippets

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/console"
	"github.com/kumi-run/kumi/eventsource"
)

// mountConsole is docs/console.md's mounting in a service.
func mountConsole(store *eventsource.Store, mux *http.ServeMux) error {
	// snippet: docs/console.md
	c, err := console.New(console.Options{
		Store:      store,                                // the *eventsource.Store
		Categories: map[string]string{"orders": "order"}, // to measure lag
	})
	if err != nil {
		return err // a *kumierr.ConfigError names the field
	}
	mux.Handle("/console/", http.StripPrefix("/console", c))
	// end snippet
	return nil
}

func TestMountConsole(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	require.NoError(t, mountConsole(newStore(t), mux))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	code, body := get(t, srv.URL+"/console/")
	require.Equal(t, http.StatusOK, code, body)
	require.True(t, strings.Contains(body, "kumi"), body)
	code, body = get(t, srv.URL+"/console/api/overview")
	require.Equal(t, http.StatusOK, code, body)
}
