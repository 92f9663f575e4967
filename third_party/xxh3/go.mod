module github.com/zeebo/xxh3

go 1.22

require (
	github.com/klauspost/cpuid/v2 v2.2.10
	github.com/zeebo/assert v1.3.0
)

require golang.org/x/sys v0.30.0 // indirect

replace github.com/zeebo/xxh3/avo => ./avo
