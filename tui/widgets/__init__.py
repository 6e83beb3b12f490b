"""Widgets shared by the dashboard's screens."""
