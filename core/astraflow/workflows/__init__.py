"""Built-in agentic workflows and the trajectory builder they share."""
