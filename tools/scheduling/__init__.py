"""The scheduling benchmark (issue 5): lateness of delayed updates under the lighting LAMP load."""
