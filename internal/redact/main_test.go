package redact

import (
	"testing"

	"github.com/kumi-run/kumi/internal/leaktest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }
