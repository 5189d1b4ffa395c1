class Engine:
    def generate(self, prompt):
        return f"original:{prompt}"

    def sleep(self, level=1):
        return level
