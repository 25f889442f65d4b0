"""Shipped tuning tables (data only): <backend>/<arch>.yaml, read by tritonsoftmax.tuning."""
