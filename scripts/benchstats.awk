# Helpers shared by scripts/bench.sh and scripts/peerbench.sh (awk -f): medians,
# ranges and number formatting of `go test -bench` output.
# value of the metric named unit on a benchmark line, or "" when absent
function metric(unit,   i) {
	for (i = 4; i <= NF; i++) if ($i == unit) return $(i - 1)
	return ""
}
function median(list,   a, n, i, j, t) {
	n = split(list, a, " ")
	for (i = 2; i <= n; i++) {
		t = a[i] + 0
		for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]
		a[j + 1] = t
	}
	if (n == 0) return ""
	if (n % 2) return a[(n + 1) / 2]
	return (a[n / 2] + a[n / 2 + 1]) / 2
}
function minmax(list,   a, n, i, lo, hi) {
	n = split(list, a, " ")
	lo = hi = a[1] + 0
	for (i = 2; i <= n; i++) {
		if (a[i] + 0 < lo) lo = a[i] + 0
		if (a[i] + 0 > hi) hi = a[i] + 0
	}
	return lo " " hi
}
function fmtnum(x) {
	if (x >= 100) return sprintf("%.0f", x)
	if (x >= 10) return sprintf("%.1f", x)
	return sprintf("%.2f", x)
}
