# C layout of the client side of a request (Cython pure-Python mode; downstream.py stays the source): the cdef
# base of the h1 connection (through ResponseWriter, h1/writer.pxd) and of the h2 stream (h2/stream.pxd). The
# exchange holds its client typed (relay.pxd): these fields are struct members and these calls, the ones every
# request makes, C calls through the vtable (a test's Python subclass still overrides them).
from workers.l7.contract cimport L7Context

# What a client connection is (SNI, TLS, client address...): made once per connection, read by admission per
# request; read-only once made.
cdef class ConnectionFacts:
    cdef readonly str client_ip, scheme, protocol
    cdef readonly object sni, tls_version, client_cert
    cdef readonly bint tls, external, acme_only
    cdef readonly Py_ssize_t refuse_status

cdef class Downstream:
    cdef public L7Context ctx
    cdef public object loop, facts
    cpdef send_head(self, status, reason, headers, body)
    cpdef send_body(self, data)
    cpdef send_end(self)
    cpdef flush(self)
    cpdef body_taken(self)
    cpdef exchange_done(self, ex)
