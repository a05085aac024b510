"""``llmgw server``'s parts: its settings (``settings``), their resolution (``config``), the HTTP front
(``front``), TLS on its HTTP port (``httptls``: the context and its marks; ``apicert``: the certificate issued
from the cluster CA and renewed; ``config.tls_plan`` decides whether TLS is on), and the start and stop of the
control plane and router in one process (``llmgw.serve``)."""
