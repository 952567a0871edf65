# C layout of a worker's counter handle (Cython pure-Python mode; counters.py stays the source). The block and
# the header are typed views of the shared words: each update is a C load and store on the mapping, not a
# memoryview item call and a Python int. The per-request updates are cpdef with C locals, and the worker's
# context holds its counters typed (workers/l7_context.pxd): a request's accounting is C calls.
cimport cython

cdef class WorkerCounters:
    cdef public unsigned long long[::1] words, _header
    cdef public Py_ssize_t services
    cpdef Py_ssize_t _row(self, Py_ssize_t sidx)  # per request, from request/upstream/traffic: a C call
    @cython.locals(i=Py_ssize_t, index=dict)  # index.get: a C call on a dict
    cpdef inc(self, name, n=*)
    @cython.locals(i=Py_ssize_t, value="long long")
    cpdef add_gauge(self, name, delta)
    @cython.locals(w="unsigned long long[::1]", row=Py_ssize_t, i=Py_ssize_t, us="unsigned long long",
                   epoch="unsigned long long", s=Py_ssize_t)
    cpdef request(self, Py_ssize_t sidx, Py_ssize_t status, double seconds)  # C values: no int objects per request
    @cython.locals(w="unsigned long long[::1]", index=Py_ssize_t, offset=Py_ssize_t, by_name=dict)
    cpdef upstream(self, sidx, name)
    @cython.locals(w="unsigned long long[::1]", i=Py_ssize_t)
    cpdef refused(self, refusal)
    @cython.locals(i=Py_ssize_t)
    cpdef traffic(self, external, what=*)
    # per L4 connection, from the door (door.pxd): C calls on C values
    @cython.locals(i=Py_ssize_t)
    cpdef l4_connection(self, Py_ssize_t sidx)
    @cython.locals(w="unsigned long long[::1]", row=Py_ssize_t)
    cpdef l4_closed(self, Py_ssize_t sidx, unsigned long long bytes_in, unsigned long long bytes_out)
