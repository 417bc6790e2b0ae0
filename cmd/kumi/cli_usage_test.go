package main

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

func TestUsage(t *testing.T) {
	t.Parallel()
	db := []string{"DATABASE_URL=" + pgtest.URL(t)}
	cases := []struct {
		name   string
		args   []string
		code   int
		stream string // "stdout" or "stderr"
		want   string
	}{
		{"NoArgumentsPrintsHelpToStderr", nil, exitUsage, "stderr", "Usage: kumi <command>"},
		{"HelpExitsZero", []string{"--help"}, exitOK, "stdout", "relinquish"},
		{"CommandHelpNamesItsFlags", []string{"checkpoints", "reset", "--help"}, exitOK, "stdout", "--force"},
		{"UnknownCommand", []string{"frobnicate"}, exitUsage, "stderr", `kumi: unexpected argument frobnicate`},
		{"FlagWithoutValue", []string{"status", "-s"}, exitUsage, "stderr", "kumi status: --subscription needs a value\n"},
		{"Version", []string{"--version"}, exitOK, "stdout", "kumi "},
		// The console package's refusal, once prefixed: not "kumi console: console: …".
		{"ConsoleShortToken", []string{"console", "--token", "short", "--listen", "127.0.0.1:0"}, exitUsage, "stderr", "kumi console: --token: 5 bytes"},
		{"HelpShowsTheSchemaDefault", []string{"--help"}, exitOK, "stdout", "(default: kumi)"},
		{"ResizeHelpSaysTheLimit", []string{"resize", "--help"}, exitOK, "stdout", "1 to " + strconv.Itoa(leasestore.MaxBuckets)},
		{"UnknownFlag", []string{"status", "--bogus"}, exitUsage, "stderr", "unknown flag --bogus"},
		{"MissingSubcommand", []string{"dead-letters"}, exitUsage, "stderr", `expected one of "list"`},
		{"MissingRequiredFlag", []string{"dead-letters", "list"}, exitUsage, "stderr", "--subscription"},
		{"BadNumber", []string{"relinquish", "-s", "x", "--bucket", "two"}, exitUsage, "stderr", "--bucket"},
		{"NegativeBucket", []string{"relinquish", "-s", "x", "--bucket=-1"}, exitUsage, "stderr", "numbered from 0"},
		// A separate negative value is the same value, not a short flag.
		{"NegativeBucketSeparate", []string{"relinquish", "-s", "x", "--bucket", "-1"}, exitUsage, "stderr", "--bucket -1: buckets are numbered from 0"},
		{"NegativeWaitSeparate", []string{"relinquish", "-s", "x", "--bucket", "1", "--wait", "-5s"}, exitUsage, "stderr", "--wait -5s: must not be negative"},
		{"NegativeAfterSeparate", []string{"dead-letters", "list", "-s", "x", "--after", "-5"}, exitUsage, "stderr", "--after -5: positions are >= 0"},
		{"NegativePositionSeparate", []string{"checkpoints", "reset", "-s", "x", "--bucket", "1", "--position", "-5"}, exitUsage, "stderr", "positions are >= 0"},
		// Beyond int4: refused before the database is asked, by every command.
		{"HugeBucketList", []string{"dead-letters", "list", "-s", "x", "--bucket", "2147483648"}, exitUsage, "stderr", "--bucket 2147483648: buckets are numbered from 0 to 8191 at most"},
		{"HugeBucketReplay", []string{"dead-letters", "replay", "-s", "x", "--bucket", "2147483648", "--dry-run"}, exitUsage, "stderr", "--bucket 2147483648: buckets are numbered from 0 to 8191 at most"},
		{"HugeBucketReset", []string{"checkpoints", "reset", "-s", "x", "--bucket", "2147483648", "--position", "0"}, exitUsage, "stderr", "--bucket 2147483648: buckets are numbered from 0 to 8191 at most"},
		{"HugeBucketRelinquish", []string{"relinquish", "-s", "x", "--bucket", "2147483648"}, exitUsage, "stderr", "--bucket 2147483648: buckets are numbered from 0 to 8191 at most"},
		{"BadEventID", []string{"dead-letters", "show", "-s", "x", "nope"}, exitUsage, "stderr", `"nope" is not a UUID`},
		{"ReplayNeedsExec", []string{"dead-letters", "replay", "-s", "x"}, exitUsage, "stderr", "--exec COMMAND"},
		{"ResetNeedsBuckets", []string{"checkpoints", "reset", "-s", "x", "--position", "0"}, exitUsage, "stderr", "--bucket B"},
		{"ResetNeedsPosition", []string{"checkpoints", "reset", "-s", "x", "--bucket", "1"}, exitUsage, "stderr", "--position"},
		{"ResetNegativePosition", []string{"checkpoints", "reset", "-s", "x", "--bucket", "1", "--position=-5"}, exitUsage, "stderr", "positions are >= 0"},
		{"CategoryWithoutSubscription", []string{"status", "-c", "account"}, exitUsage, "stderr", "--category needs --subscription"},
		{"BadGroupSize", []string{"migrate", "--group-size", "0"}, exitUsage, "stderr", "--group-size 0"},
		{"InvalidSubscriptionName", []string{"status", "-s", " padded"}, exitUsage, "stderr", "white space"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := kumi(t, db, c.args...)
			require.Equal(t, c.code, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
			out := r.stdout
			if c.stream == "stderr" {
				out = r.stderr
			}
			require.Contains(t, out, c.want)
		})
	}
}
