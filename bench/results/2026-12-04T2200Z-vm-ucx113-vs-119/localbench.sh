#!/bin/bash
# local UCX benchmark: bundle dir $1
u=/work/main/$1
cd /work/main && gunzip -kf "$u/tensorfs.gz" "$u/tests.test.gz"
export LD_LIBRARY_PATH=$u/lib UCX_MODULE_DIR=$u/lib/ucx TENSORFS_BIN=$u/tensorfs
echo "== $(cat $u/COMMIT) UCX $(cat $u/UCX_VERSION)"
cd tests
$u/tests.test -test.run='^$' -test.bench='BenchmarkInPlace(4K|Scatter1000x8K)/^(tcp|ucx-sm)$' -test.benchtime=40x -test.count=1
INPLACE_BIG_MB=1 $u/tests.test -test.run='^$' -test.bench='BenchmarkInPlaceBig/^(tcp|ucx-sm)$' -test.benchtime=200x -test.count=1
INPLACE_BIG_MB=1024 $u/tests.test -test.run='^$' -test.bench='BenchmarkInPlaceBig/^(tcp|ucx-sm)$' -test.benchtime=5x -test.count=1
for t in "ucp_put_lat 4096" "ucp_put_bw 1048576" "ucp_put_bw 1073741824"; do
  set -- $t
  n=$([ "$2" -gt 1000000 ] && echo 20 || echo 20000); [ "$2" -gt 100000000 ] && n=10
  echo "== ucx_perftest UCX_TLS=sm,self -t $1 -s $2 -n $n"
  UCX_TLS=sm,self $u/ucx_perftest -t $1 -s $2 -n $n > /tmp/perf-server.txt 2>&1 &
  srv=$!; sleep 1
  UCX_TLS=sm,self timeout 120 $u/ucx_perftest 127.0.0.1 -t $1 -s $2 -n $n 2>&1 | tail -3
  wait $srv
done
