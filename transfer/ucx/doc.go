// Package ucx is tensorfs's binding of UCX's UCP layer (libucp, Debian's
// libucx-dev) for one-sided transfers between daemons: one UCP context and
// worker per daemon (Context), memory regions mapped for remote access
// (Region, whose packed rkey a peer unpacks into a RemoteKey), endpoints
// made from worker addresses exchanged on the tensorfs connection
// (Endpoint), and descriptor lists posted as many puts or gets completed
// by one flush. UCX picks the transport (RDMA verbs, shared memory, CMA,
// TCP) by itself; UCX_TLS and UCX_NET_DEVICES steer it.
//
// Everything but this comment is behind the build tag ucx (cgo, linked
// against libucp and libucs): the default build of tensorfs stays pure Go
// (CGO_ENABLED=0) and has no UCX. DESIGN.md, "Between hosts: UCX for the
// bytes, etcd for the membership", says where this is going; issue 17 the
// order of the work.
package ucx
