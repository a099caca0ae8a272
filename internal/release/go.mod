module github.com/leasefence/leasefence/internal/release

go 1.26.0

toolchain go1.26.10

require golang.org/x/mod v0.42.0
