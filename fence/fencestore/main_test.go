package fencestore_test

import (
	"os"
	"testing"

	"github.com/leasefence/leasefence/internal/etcdproc"
)

var etcd etcdproc.Env

func TestMain(m *testing.M) { os.Exit(etcd.Main(m, etcdproc.Config{})) }
