package fencegrpc_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdtest"
)

var etcd etcdtest.Env

func TestMain(m *testing.M) { os.Exit(etcd.Main(m, etcdtest.Config{})) }

func testCtx(t testing.TB) context.Context { return etcdtest.Ctx(t, 30*time.Second) }
