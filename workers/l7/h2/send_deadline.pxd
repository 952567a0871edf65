# C layout of an h2 connection's send deadlines (Cython pure-Python mode; send_deadline.py stays the source).
# stream_done and progress are C calls from the connection (connection.pxd types the field where it calls
# them); the bridge and the streams stay plain objects here, so the tests' stand-ins still serve.
cdef class SendDeadlines:
    cdef public object _bridge, _loop, _socket
    cdef public dict _stalled
    cdef public list _finishing
    cdef public double timeout
    cpdef stream_paused(self, st)
    cpdef stream_done(self, st, Py_ssize_t queued)
    cpdef progress(self)
    cpdef _arm(self, st)
    cpdef _sent(self, st)
