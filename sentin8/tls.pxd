# C layout of the per-record OpenSSL calls (Cython pure-Python mode; tls.py stays the source): the TLS layer
# holds its RecordIO typed (workers/tls_layer.pxd), so each read, write, feed and drain is a C call.
cdef class RecordIO:
    cdef public object _owner, _ssl, _into, _from
    cdef public bint _fed_big
    cpdef handshake(self)
    cpdef feed(self, data)
    cpdef read(self)
    cpdef write(self, data)
    cpdef drain(self)
    cpdef shutdown(self)
    cpdef _renew_out(self)
    cpdef _renew_into(self)

cpdef object _scratch()  # twice per request: a C call from RecordIO
