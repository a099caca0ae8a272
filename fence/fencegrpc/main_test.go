package fencegrpc_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
)

var etcd etcdproc.Env

func TestMain(m *testing.M) { os.Exit(etcd.Main(m, etcdproc.Config{})) }

func testCtx(t testing.TB) context.Context { return etcdproc.Ctx(t, 30*time.Second) }
