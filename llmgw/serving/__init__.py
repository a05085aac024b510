"""``llmgw server``'s parts: its settings (``settings``), their resolution (``config``), the HTTP front
(``front``), and the start and stop of the control plane and router in one process (``llmgw.serve``)."""
