"""Reports: tables, figures and summaries written into run directories."""
