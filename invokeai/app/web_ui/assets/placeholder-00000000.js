document.title = "InvokeAI";
