# C declarations for routing.py (Cython pure-Python mode; the .py stays the source). ``RoutingTable`` is a msgspec
# Struct and cannot be a cdef class: the per-request lookups it makes live in these functions instead, where
# the dict and the name are typed (``get``, ``lower``, ``rstrip`` and ``find`` as C calls).
cpdef _resolve_in(dict routes, str hostname)
cpdef list _instances_in(dict services, service)
