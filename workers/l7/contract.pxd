# C layout of the L7 package's view of its worker (Cython pure-Python mode; contract.py stays the source): the
# connections, streams, admission and the exchange hold their L7Context typed, so each call is a C call through
# the vtable (the worker's WorkerL7Context overrides them in C; a test's Python subclass still overrides them).
from workers.upstream cimport UpstreamPool

# What the policy hook reads of a request (one per request): a C struct, made without a Python __init__'s
# argument parsing and read by the worker's policy as struct members.
cdef class RequestInfo:
    cdef public object method, target, path, host, client_ip, route, headers, scheme

cdef class L7Context:
    cdef public object cfg
    cdef public UpstreamPool pool  # acquire, release, write_soon per request: C calls
    cpdef resolve(self, host)
    cpdef candidates(self, service)
    cpdef backend_failed(self, instance)
    cpdef count(self, name, n=*)
    cpdef refused(self, refusal)
    cpdef service_id(self, service)
    cpdef upstream(self, sidx, name)
    cpdef request_done(self, ex, seconds)
    cpdef inflight(self, delta)
    cpdef policy(self, request)
    cpdef upstream_tls(self, instance)
    cpdef waf_gate(self)
    cpdef upstream_result(self, instance_id, ok)
    cpdef overloaded(self)
