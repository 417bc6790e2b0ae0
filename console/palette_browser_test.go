package console

import (
	"fmt"
	"math"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// TestWorkersLookApart runs five workers whose names differ only in their
// last character, w1 to w5, and checks in Chromium that the map paints them
// in colours a reader tells apart (they were 1° of hue apart, w2 to w4 the
// same green), the same colour in the map and in the workers' table.
//
// Not parallel: five workers' pools beside the other browser tests' would
// crowd the test server's connections.
func TestWorkersLookApart(t *testing.T) {
	f := newFixture(t)
	_, srv := f.serve(t, Options{Categories: map[string]string{"live": "acct"}})
	b := newBrowser(t)
	workers := []string{"w1", "w2", "w3", "w4", "w5"}
	for _, w := range workers {
		startBrowserWorker(t, f.schema, w)
	}
	b.run(t, chromedp.Navigate(srv.URL+"/s/live"))
	b.waitFor(t, owners+` === 'w1,w2,w3,w4,w5'`, "each of the five workers owns buckets")
	b.waitFor(t, `document.querySelectorAll('#workers tr').length === 5`, "the five workers are listed")

	cell := map[string][3]float64{}
	for _, w := range workers {
		onMap := eval[string](t, b, fmt.Sprintf(
			`getComputedStyle(document.querySelector('#map .cell[data-owner="%s"]')).backgroundColor`, w))
		inTable := eval[string](t, b, fmt.Sprintf(`getComputedStyle([...document.querySelectorAll('#workers tr')].
			find(tr => tr.children[1].textContent === '%s').querySelector('.swatch')).backgroundColor`, w))
		require.Equal(t, onMap, inTable, "%s has one colour on the page", w)
		cell[w] = parseRGB(t, onMap)
	}
	for i, a := range workers {
		for _, c := range workers[i+1:] {
			d := deltaE76(cell[a], cell[c])
			require.Greater(t, d, 20.0, "%s %v and %s %v look apart (CIE76 ΔE %.1f)", a, cell[a], c, cell[c], d)
		}
	}

	t.Run("StandingByIsNotExpired", func(t *testing.T) {
		// Cells made here, outside the map the page redraws, with the
		// classes and the three lines the page gives them.
		style := func(classes, prop string) string {
			return eval[string](t, b, fmt.Sprintf(`(() => {
				const c = document.createElement('div');
				c.className = %q;
				document.body.append(c);
				const v = getComputedStyle(c)[%q];
				c.remove();
				return v;
			})()`, classes, prop))
		}
		require.Equal(t, "dashed", style("cell expired", "borderTopStyle"), "an expired lease is dashed")
		require.NotEqual(t, "dashed", style("cell standby", "borderTopStyle"), "a standing-by bucket is not")
		require.Contains(t, style("cell standby", "backgroundImage"), "gradient", "it is hatched")
	})

	t.Run("AnOldGenerationCellShowsItsText", func(t *testing.T) {
		fits := eval[bool](t, b, `(() => {
			const c = document.createElement('div');
			c.className = 'cell';
			c.style.width = '92px';
			for (const [cls, text] of [['b', '#31'], ['o', 'a-rather-long-worker-name'], ['s', 'proposed 123456789']]) {
				const d = document.createElement('div');
				d.className = cls;
				d.textContent = text;
				c.append(d);
			}
			document.querySelector('#map').parentElement.append(c);
			const ok = c.scrollHeight <= c.clientHeight && [...c.children].every(d => d.scrollHeight <= d.clientHeight);
			c.remove();
			return ok;
		})()`)
		require.True(t, fits, "bucket, owner and state fit in the cell, none cut through")
	})

	require.Empty(t, b.takeErrors(), "no console errors, exceptions or dialogs")
}

// parseRGB reads a computed colour, "rgb(r, g, b)".
func parseRGB(t *testing.T, s string) [3]float64 {
	t.Helper()
	var c [3]float64
	_, err := fmt.Sscanf(s, "rgb(%g, %g, %g)", &c[0], &c[1], &c[2])
	require.NoError(t, err, "a computed colour: %q", s)
	return c
}

// deltaE76 is the CIE76 distance between two sRGB colours (0–255): about 2
// is the smallest difference an eye sees side by side; 20 is plainly apart.
func deltaE76(a, b [3]float64) float64 {
	la, lb := lab(a), lab(b)
	return math.Sqrt(sq(la[0]-lb[0]) + sq(la[1]-lb[1]) + sq(la[2]-lb[2]))
}

func sq(x float64) float64 { return x * x }

// lab converts sRGB (0–255) to CIE L*a*b* under D65.
func lab(c [3]float64) [3]float64 {
	var lin [3]float64
	for i, v := range c {
		v /= 255
		if v > 0.04045 {
			lin[i] = math.Pow((v+0.055)/1.055, 2.4)
		} else {
			lin[i] = v / 12.92
		}
	}
	x := (0.4124*lin[0] + 0.3576*lin[1] + 0.1805*lin[2]) / 0.95047
	y := 0.2126*lin[0] + 0.7152*lin[1] + 0.0722*lin[2]
	z := (0.0193*lin[0] + 0.1192*lin[1] + 0.9505*lin[2]) / 1.08883
	f := func(v float64) float64 {
		if v > 0.008856 {
			return math.Cbrt(v)
		}
		return 7.787*v + 16.0/116
	}
	fx, fy, fz := f(x), f(y), f(z)
	return [3]float64{116*fy - 16, 500 * (fx - fy), 200 * (fy - fz)}
}
