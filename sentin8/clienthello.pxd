# C types for the ClientHello parser (Cython pure-Python mode; clienthello.py stays the source): it runs for
# every new connection, so its offsets are C integers and its byte reads C loads, not Python ints.
cimport cython

cdef class ClientHello:
    cdef readonly object sni
    cdef readonly tuple alpn
    cdef readonly Py_ssize_t size

cpdef Py_ssize_t _min_wire(Py_ssize_t body_len)

@cython.locals(n=Py_ssize_t, pos=Py_ssize_t, empty=Py_ssize_t, ctype=int, length=Py_ssize_t, end=Py_ssize_t,
               at=Py_ssize_t, body_len=Py_ssize_t, msg=bytes)
cpdef parse(bytes buf, Py_ssize_t limit=*)

@cython.locals(body_len=Py_ssize_t)
cdef Py_ssize_t _message_length(bytes data, Py_ssize_t at, Py_ssize_t limit) except -1

@cython.locals(start=Py_ssize_t, end=Py_ssize_t)
cpdef tuple _vec(bytes buf, Py_ssize_t pos, int width, Py_ssize_t limit)

@cython.locals(start=Py_ssize_t, end=Py_ssize_t, pos=Py_ssize_t, ext_end=Py_ssize_t,
               sni_at=Py_ssize_t, sni_end=Py_ssize_t, alpn_at=Py_ssize_t, alpn_end=Py_ssize_t, etype=int)
cpdef _parse_body(bytes data, Py_ssize_t first, Py_ssize_t n, Py_ssize_t size)

@cython.locals(pos=Py_ssize_t, end=Py_ssize_t, start=Py_ssize_t)
cpdef str _server_name(bytes data, Py_ssize_t first, Py_ssize_t last)

@cython.locals(i=Py_ssize_t, c=int, label=Py_ssize_t, nul=bint, non_ascii=bint, dns=bint, after_dot=bint)
cpdef str _hostname(bytes data, Py_ssize_t start, Py_ssize_t end)

@cython.locals(pos=Py_ssize_t, end=Py_ssize_t, start=Py_ssize_t)
cpdef tuple _alpn(bytes data, Py_ssize_t first, Py_ssize_t last)
