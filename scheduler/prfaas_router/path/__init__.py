"""The request path (router mode): the proxy that parses, routes, prefills (remote or local, retried once) and
decodes each client request, carried by one per-request object (:class:`.call.Call`) that reports its outcome
once. Independent of the gateway."""
