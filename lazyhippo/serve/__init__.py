"""Serving warm indexes: the index pool, engine processes, the HTTP app, the MCP tool and the chat loop."""
