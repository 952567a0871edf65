# C layout of the engine adapter's server connection (Cython pure-Python mode; h2_engine.py stays the source):
# every field a C struct member, all public; the methods the h2 shell calls per stream are cpdef, so a caller
# that holds it typed (workers/l7/h2/lifecycle.pxd) calls them in C.
cdef class ServerConnection:
    cdef public object _c, _final, _peer_goaway, ended
    cdef public dict _streams, _unconsumed
    cdef public set _opened
    cdef public list _late, _rst_after_flush
    cdef public Py_ssize_t _conn_window, _drain, _reduction, control, last_stream_id, payload, received
    cdef public bint _dead, events_waiting
    cpdef receive(self, data)
    cpdef consume(self, stream_id, n)
    cpdef _release(self, stream_id)
    cpdef _ack(self, stream_id, n)
    cpdef send_interim(self, stream_id, status, fields)
    cpdef send_head(self, stream_id, status, fields, end_stream=*)
    cpdef send_data(self, stream_id, data, end_stream=*)
    cpdef end_stream(self, stream_id)
    cpdef reset(self, stream_id, error_code=*)
    cpdef _head(self, status, fields)
    cpdef _response_done(self, stream_id)
    cpdef data_to_send(self)
    cpdef take_events(self)
    cpdef buffered(self, stream_id=*)
