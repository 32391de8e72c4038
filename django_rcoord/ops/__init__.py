"""Operations: the staff dashboard, status overview, metrics and Prometheus exposition."""
