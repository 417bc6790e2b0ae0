package kumitest_test

import (
	"testing"

	"github.com/kumi-run/kumi/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
