"""The thunder router's HTTP gateway: ``create_app`` builds one router's object graph."""
