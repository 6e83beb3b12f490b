"""One module per dashboard screen; each is a Textual mode of tui.app.DashboardApp."""
