# C layout of the edge policy (Cython pure-Python mode; policy.py stays the source): the worker's context holds
# it typed (l7_context.pxd), so each request's check is a C call, and so is the rate limit it asks.
cdef class EdgePolicy:
    cdef public object cfg, buckets, clock, share, _engine, _engine_cfg, _engine_lock
    cpdef rate_limit(self, client_ip, host)
    cpdef check(self, client_ip, host, target)
